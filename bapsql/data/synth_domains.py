"""The fourteen databases of the embedded benchmark, as `bapsql.data.synth_schema` specs (pure data, no logic).

Each domain has foreign keys, indexes on some columns and not others, Zipf-skewed categories and foreign keys,
NULLs, dirty values (case/whitespace variants, 'N/A') and coded columns whose meaning only an evidence hint gives.
At ``full`` scale the largest tables hold 10^5–10^6 rows; at ``small`` scale 10^3–10^4.
"""

from __future__ import annotations

from bapsql.data.synth_schema import Col, Domain, Table

FIRST = tuple("""Ada Alan Alice Amir Anna Ben Carla Chen Clara Dan Diego Elena Emma Eric Fatima Felix Grace Hana Hugo
Ines Ivan Jack Jana Joao Julia Kai Karl Lara Leo Lina Luca Maria Mark Maya Mei Nia Noah Nora Omar
Olga Paul Priya Rosa Sam Sara Tom Vera Yuki""".split())
LAST = tuple("""Abbott Baker Bauer Becker Brooks Carter Chen Cruz Diaz Dubois Evans Fischer Garcia Gomez Grant Hall
Hansen Hill Ito Jensen Kim Klein Kowalski Lee Lopez Martin Meyer Moreau Murphy Nguyen Novak Ortiz
Park Patel Perez Price Quinn Reed Reyes Rossi Russo Sato Schmidt Silva Singh Smith Stone Suzuki
Tanaka Torres Turner Vogel Walker Wang Ward Weber Wilson Wolf Young Zhang""".split())
TOWNS = tuple(a + b for a in "Ash Bell Birch Brook Cedar Clay Elm Fair Glen Green Hazel Iron Lake Maple Mill North "
              "Oak Pine Red Rock".split()
              for b in "ford ton field wood bury ville dale haven port mouth stead burg mere vale wick".split())
STREETS = tuple("""Elm Oak Pine Maple Cedar Birch Walnut Chestnut Willow Poplar Spruce Cherry Hickory Aspen Magnolia
Laurel Juniper Holly Linden Sycamore Market Mill Church Bridge River Lake Park Hill Station Harbor
Union Liberty Garden Meadow Orchard Forest Canal Castle Queen King""".split())
CITY_VALUES = ("Ashford", "Bellport", "Cedarville", "Elmwood", "Fairhaven", "Glendale", "Hazelton", "Lakeport",
               "Maplewood", "Northfield", "Oakdale", "Pinecrest", "Redmond", "Rockford", "Stonebury", "Westmere")


def _person(index: bool = False) -> Col:
    return Col("name", "name", "name", words=(FIRST, LAST), index=index)


RETAIL = Domain("retail_orders", "an online retail shop", (
    Table("customers", "customer", "customers", 1_500, 40_000, (
        Col("id", "pk", "id"), _person(index=True),
        Col("city", "cat", "city", values=CITY_VALUES, zipf=1.1, dirty=0.08),
        Col("tier", "code", "tier", values=("B", "S", "G", "P"), labels=("basic", "silver", "gold", "premium"),
            phrase="{label} customers", zipf=0.9),
        Col("signup_date", "date", "signup date", lo=2018, hi=2024),
        Col("age", "int", "age", lo=18, hi=85, nulls=0.06))),
    Table("products", "product", "products", 300, 3_000, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(
            tuple("Classic Compact Deluxe Eco Elite Essential Everyday Fresh Grand Handy Light Modern Nordic Pro Pure "
                  "Quick Rapid Royal Smart Solid Sonic Sturdy Swift Titan Ultra Urban Vintage Vivid Zen Prime".split()),
            tuple("Bamboo Canvas Ceramic Copper Cotton Glass Leather Linen Maple Marble Oak Silk Steel Stone "
                  "Wool".split()),
            tuple("Backpack Blender Bottle Bowl Candle Chair Clock Desk Fan Grinder Hammock Headset Jacket Kettle Lamp "
                  "Mat Mirror Mug Notebook Pan Pillow Planter Rug Scarf Shelf Speaker Stool Teapot Towel "
                  "Vase".split()))),
        Col("category", "cat", "category", values=("home", "kitchen", "outdoor", "electronics", "apparel", "office",
                                                   "garden", "toys", "beauty", "sports"), zipf=0.8),
        Col("unit_price", "float", "unit price", lo=25.0, hi=0.8, dist="lognormal", decimals=2),
        Col("stock", "int", "stock", lo=0, hi=500, nulls=0.05))),
    Table("orders", "order", "orders", 5_000, 150_000, (
        Col("id", "pk", "id"), Col("customer_id", "fk", "customer", ref="customers", zipf=0.7, index=True),
        Col("order_date", "date", "order date", lo=2019, hi=2024, index=True),
        Col("status", "cat", "status", values=("delivered", "shipped", "pending", "cancelled", "returned"), zipf=1.6,
            index=True),
        Col("channel", "code", "channel", values=("W", "M", "S"), labels=("web", "mobile", "in-store"),
            phrase="{label} orders", zipf=0.8),
        Col("total_amount", "float", "total amount", lo=60.0, hi=0.9, dist="lognormal", decimals=2, nulls=0.02))),
    Table("order_items", "order item", "order items", 12_000, 400_000, (
        Col("id", "pk", "id"), Col("order_id", "fk", "order", ref="orders", zipf=0.2, index=True),
        Col("product_id", "fk", "product", ref="products", zipf=1.0),
        Col("quantity", "int", "quantity", lo=1.2, hi=0.7, dist="lognormal"),
        Col("discount", "float", "discount", lo=0.0, hi=0.3, decimals=2, nulls=0.6))),
))

FLIGHTS = Domain("flights", "commercial flights", (
    Table("airlines", "airline", "airlines", 30, 60, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(
            tuple("Sky Blue Aero Pacific Atlantic Northern Southern Coastal Alpine Polar Summit Golden Silver Star "
                  "Sun".split()), ("Airways", "Air", "Jet", "Airlines", "Express", "Wings", "Connect", "Flyer"))),
        Col("country", "cat", "country", values=("USA", "Canada", "Mexico", "Brazil", "UK", "Germany", "Japan"),
            zipf=1.0),
        Col("founded", "int", "founding year", lo=1950, hi=2015))),
    Table("airports", "airport", "airports", 150, 600, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("International", "Regional", "Municipal", "Field",
                                                                 "County", "Airpark"))),
        Col("state", "cat", "state", values=("CA", "TX", "NY", "FL", "IL", "WA", "CO", "GA", "AZ", "OR", "NV", "MA"),
            zipf=0.9, dirty=0.05),
        Col("elevation", "int", "elevation in feet", lo=400, hi=1.0, dist="lognormal", nulls=0.04))),
    Table("flights", "flight", "flights", 8_000, 300_000, (
        Col("id", "pk", "id"), Col("airline_id", "fk", "airline", ref="airlines", zipf=1.0, index=True),
        Col("origin_id", "fk", "origin airport", ref="airports", zipf=1.1, index=True),
        Col("dest_id", "fk", "destination airport", ref="airports", zipf=1.1),
        Col("flight_date", "date", "flight date", lo=2021, hi=2023),
        Col("dep_delay", "int", "departure delay in minutes", lo=8, hi=1.1, dist="lognormal", nulls=0.03),
        Col("status", "cat", "status", values=("on time", "delayed", "cancelled", "diverted"), zipf=2.0),
        Col("distance", "int", "distance in miles", lo=700, hi=0.6, dist="lognormal"))),
))

SCHOOLS = Domain("schools", "public schools", (
    Table("districts", "district", "districts", 20, 60, (
        Col("id", "pk", "id"), Col("name", "name", "name", unique=True, words=(TOWNS, ("District",))),
        Col("county", "cat", "county", values=("Alder", "Bramble", "Cobalt", "Dune", "Ember", "Fern"), zipf=0.7))),
    Table("schools", "school", "schools", 150, 1_200, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("Elementary", "Middle School", "High School",
                                                                 "Academy", "Charter School"))),
        Col("district_id", "fk", "district", ref="districts", zipf=0.8, index=True),
        Col("type", "cat", "type", values=("elementary", "middle", "high", "charter"), zipf=0.9, dirty=0.06),
        Col("enrollment", "int", "enrollment", lo=450, hi=0.5, dist="lognormal"),
        Col("opened", "int", "opening year", lo=1920, hi=2020, nulls=0.1))),
    Table("students", "student", "students", 3_000, 60_000, (
        Col("id", "pk", "id"), _person(index=True),
        Col("school_id", "fk", "school", ref="schools", zipf=0.6, index=True),
        Col("grade", "int", "grade", lo=1, hi=12),
        Col("gender", "code", "gender", values=("F", "M", "X"), labels=("female", "male", "non-binary"),
            phrase="{label} students", zipf=0.2),
        Col("lunch", "code", "lunch program", values=("N", "F", "R"), labels=("no", "free", "reduced-price"),
            phrase="students on the {label} lunch program", zipf=0.8))),
    Table("scores", "test score", "test scores", 8_000, 250_000, (
        Col("id", "pk", "id"), Col("student_id", "fk", "student", ref="students", zipf=0.3, index=True),
        Col("subject", "cat", "subject", values=("math", "reading", "science", "history", "art", "music"), zipf=0.6),
        Col("score", "float", "score", lo=71, hi=14, dist="normal", decimals=1, nulls=0.04),
        Col("test_date", "date", "test date", lo=2022, hi=2024))),
))

CLINICS = Domain("clinics", "a network of health clinics", (
    Table("clinics", "clinic", "clinics", 30, 200, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("Clinic", "Health Center", "Medical Center",
                                                                 "Family Practice"))),
        Col("city", "cat", "city", values=CITY_VALUES, zipf=0.9, dirty=0.1),
        Col("beds", "int", "number of beds", lo=5, hi=120, nulls=0.05))),
    Table("doctors", "doctor", "doctors", 200, 2_000, (
        Col("id", "pk", "id"), _person(),
        Col("clinic_id", "fk", "clinic", ref="clinics", zipf=0.7, index=True),
        Col("specialty", "cat", "specialty", values=("general practice", "pediatrics", "cardiology", "dermatology",
                                                     "orthopedics", "neurology", "psychiatry", "oncology"), zipf=1.2),
        Col("years_experience", "int", "years of experience", lo=1, hi=40))),
    Table("patients", "patient", "patients", 3_000, 80_000, (
        Col("id", "pk", "id"), _person(index=True), Col("birth_year", "int", "birth year", lo=1935, hi=2022),
        Col("sex", "code", "sex", values=("F", "M"), labels=("female", "male"), phrase="{label} patients", zipf=0.1),
        Col("insurance", "cat", "insurance", values=("public", "private", "none"), zipf=0.8, na=0.07))),
    Table("visits", "visit", "visits", 8_000, 250_000, (
        Col("id", "pk", "id"), Col("patient_id", "fk", "patient", ref="patients", zipf=0.4, index=True),
        Col("doctor_id", "fk", "doctor", ref="doctors", zipf=0.9),
        Col("visit_date", "date", "visit date", lo=2020, hi=2024, index=True),
        Col("diagnosis", "cat", "diagnosis", values=("checkup", "flu", "hypertension", "diabetes", "injury", "asthma",
                                                     "migraine", "allergy", "infection", "back pain"), zipf=1.1),
        Col("cost", "float", "cost", lo=120.0, hi=0.7, dist="lognormal", decimals=2, nulls=0.03),
        Col("urgency", "code", "urgency", values=("R", "U", "E"), labels=("routine", "urgent", "emergency"),
            phrase="{label} visits", zipf=1.5))),
))

FOOTBALL = Domain("football", "a football association", (
    Table("leagues", "league", "leagues", 6, 12, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(("Premier", "Championship", "National", "Southern",
                                                        "Northern", "Coastal"), ("League", "Division"))),
        Col("tier", "int", "tier", lo=1, hi=4))),
    Table("teams", "team", "teams", 60, 240, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("United", "City", "Rovers", "Athletic", "Wanderers",
                                                                 "Albion", "Town", "Rangers", "Harriers", "Swifts"))),
        Col("league_id", "fk", "league", ref="leagues", zipf=0.3, index=True),
        Col("founded", "int", "founding year", lo=1870, hi=2010),
        Col("stadium_capacity", "int", "stadium capacity", lo=15_000, hi=0.6, dist="lognormal", nulls=0.05))),
    Table("players", "player", "players", 1_200, 6_000, (
        Col("id", "pk", "id"), _person(), Col("team_id", "fk", "team", ref="teams", zipf=0.2, index=True),
        Col("position", "code", "position", values=("MF", "DF", "FW", "GK"),
            labels=("midfielder", "defender", "forward", "goalkeeper"), phrase="{label}s", zipf=0.6),
        Col("nationality", "cat", "nationality", values=("England", "Spain", "France", "Brazil", "Germany",
                                                         "Nigeria", "Japan", "Argentina", "Ghana", "Norway"),
            zipf=1.3, dirty=0.05),
        Col("birth_year", "int", "birth year", lo=1985, hi=2006),
        Col("market_value", "float", "market value in millions", lo=2.0, hi=1.0, dist="lognormal", decimals=2,
            nulls=0.15))),
    Table("matches", "match", "matches", 2_000, 40_000, (
        Col("id", "pk", "id"), Col("home_team_id", "fk", "home team", ref="teams", zipf=0.2, index=True),
        Col("away_team_id", "fk", "away team", ref="teams", zipf=0.2),
        Col("match_date", "date", "match date", lo=2015, hi=2024),
        Col("home_goals", "int", "home goals", lo=1.3, hi=0.8, dist="lognormal"),
        Col("away_goals", "int", "away goals", lo=1.0, hi=0.9, dist="lognormal"),
        Col("attendance", "int", "attendance", lo=12_000, hi=0.7, dist="lognormal", nulls=0.08))),
    Table("goals", "goal", "goals", 5_000, 110_000, (
        Col("id", "pk", "id"), Col("match_id", "fk", "match", ref="matches", zipf=0.3, index=True),
        Col("player_id", "fk", "scorer", ref="players", zipf=1.0),
        Col("minute", "int", "minute", lo=1, hi=95),
        Col("kind", "cat", "goal type", values=("open play", "header", "penalty", "free kick", "own goal"),
            zipf=1.5))),
))

LIBRARY = Domain("library", "a public library system", (
    Table("branches", "branch", "branches", 10, 40, (
        Col("id", "pk", "id"), Col("name", "name", "name", unique=True, words=(TOWNS, ("Library", "Branch Library"))),
        Col("opened", "int", "opening year", lo=1900, hi=2020))),
    Table("books", "book", "books", 2_000, 50_000, (
        Col("id", "pk", "id"),
        Col("title", "name", "title", unique=True, index=True, words=(
            tuple("Silent Hidden Broken Golden Crimson Distant Forgotten Hollow Endless Wild Quiet Bitter Burning "
                  "Frozen Lonely Secret Shattered Velvet Wandering Emerald Iron Last Little Lost Midnight Northern "
                  "Pale Restless Scarlet Sleeping Stolen Sunken Tender Twisted Winter Ancient Bright Dark Paper "
                  "Glass".split()),
            tuple("Garden River Mountain House Letter Promise Harbor Kingdom Orchard Shadow Voyage Island Mirror "
                  "Forest Road Tower Song Storm Crown Bridge Lantern Compass Feather Meadow Ocean Castle Ember "
                  "Journey Window Archive Circle Valley Winter Summer Signal Machine Atlas Empire Heart Silence "
                  "Thread Tide Cellar Engine Border Canyon Desert Frontier Horizon Legacy".split()),
            ("", "Returns", "Rising", "at Dawn", "in Winter", "of the North", "Chronicles", "Revisited", "Unbound",
             "Diaries", "at Midnight", "Reborn", "Lost", "Remembered", "Awakening", "of Glass", "Forever",
             "in Spring", "Beneath", "Beyond", "Trilogy", "Letters", "Legends", "Sagas", "Songs"))),
        Col("author", "cat", "author", values=tuple(f"{f} {l}" for f in FIRST[:12] for l in LAST[:25]), zipf=0.9),
        Col("genre", "cat", "genre", values=("fiction", "mystery", "romance", "science fiction", "fantasy", "history",
                                             "biography", "children", "poetry", "science"), zipf=1.0, dirty=0.07),
        Col("year", "int", "publication year", lo=1950, hi=2024),
        Col("pages", "int", "number of pages", lo=300, hi=0.4, dist="lognormal", nulls=0.08))),
    Table("members", "member", "members", 1_500, 30_000, (
        Col("id", "pk", "id"), _person(index=True), Col("branch_id", "fk", "home branch", ref="branches", zipf=0.8),
        Col("join_date", "date", "join date", lo=2010, hi=2024),
        Col("membership", "code", "membership type", values=("A", "S", "C", "R"),
            labels=("adult", "student", "child", "retiree"), phrase="{label} members", zipf=0.9))),
    Table("loans", "loan", "loans", 8_000, 300_000, (
        Col("id", "pk", "id"), Col("book_id", "fk", "book", ref="books", zipf=0.9, index=True),
        Col("member_id", "fk", "member", ref="members", zipf=0.5, index=True),
        Col("loan_date", "date", "loan date", lo=2019, hi=2024),
        Col("days_kept", "int", "days kept", lo=14, hi=0.6, dist="lognormal", nulls=0.05),
        Col("late_fee", "float", "late fee", lo=0, hi=12, decimals=2, nulls=0.75))),
))

ENERGY = Domain("energy_meters", "a utility's smart meters", (
    Table("regions", "region", "regions", 8, 20, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(("North", "South", "East", "West", "Central"),
                                                        ("Valley", "Coast", "Plains", "Highlands"))),
        Col("tariff", "float", "tariff per kWh", lo=0.1, hi=0.4, decimals=3))),
    Table("sites", "site", "sites", 100, 1_000, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("Plant", "Depot", "Works", "Campus", "Tower",
                                                                 "Mill"))),
        Col("region_id", "fk", "region", ref="regions", zipf=0.8, index=True),
        Col("type", "cat", "site type", values=("residential", "commercial", "industrial", "public"), zipf=1.0,
            dirty=0.1),
        Col("floor_area", "int", "floor area in square meters", lo=900, hi=1.0, dist="lognormal", nulls=0.1))),
    Table("meters", "meter", "meters", 300, 5_000, (
        Col("id", "pk", "id"), Col("site_id", "fk", "site", ref="sites", zipf=0.6, index=True),
        Col("kind", "code", "meter kind", values=("E", "G", "W"), labels=("electricity", "gas", "water"),
            phrase="{label} meters", zipf=1.0),
        Col("install_date", "date", "install date", lo=2012, hi=2023),
        Col("status", "cat", "status", values=("active", "faulty", "retired"), zipf=2.5))),
    Table("readings", "reading", "readings", 15_000, 800_000, (
        Col("id", "pk", "id"), Col("meter_id", "fk", "meter", ref="meters", zipf=0.4, index=True),
        Col("reading_date", "date", "reading date", lo=2022, hi=2024),
        Col("kwh", "float", "consumption in kWh", lo=35.0, hi=0.9, dist="lognormal", decimals=2, nulls=0.02),
        Col("quality", "code", "reading quality", values=("A", "E", "M"), labels=("actual", "estimated", "manual"),
            phrase="{label} readings", zipf=1.8))),
))

BIKES = Domain("bike_rentals", "a city bike-share scheme", (
    Table("stations", "station", "stations", 60, 400, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(STREETS, ("Square", "Park", "Station", "Plaza", "Market",
                                                                   "Bridge", "Gate", "Corner", "Terminal", "Yard",
                                                                   "Green", "Wharf"))),
        Col("district", "cat", "district", values=("Downtown", "Harborside", "Old Town", "University", "Riverside",
                                                   "Midtown", "Northgate", "Eastside"), zipf=0.9, dirty=0.06),
        Col("capacity", "int", "capacity", lo=10, hi=60))),
    Table("bikes", "bike", "bikes", 400, 6_000, (
        Col("id", "pk", "id"),
        Col("model", "cat", "model", values=("Metro 3", "Glide", "Cargo X", "Metro 2", "Volt E", "Trail"), zipf=1.0),
        Col("kind", "code", "bike kind", values=("C", "E"), labels=("classic", "electric"), phrase="{label} bikes",
            zipf=0.8),
        Col("purchase_year", "int", "purchase year", lo=2015, hi=2024))),
    Table("trips", "trip", "trips", 10_000, 500_000, (
        Col("id", "pk", "id"), Col("bike_id", "fk", "bike", ref="bikes", zipf=0.3),
        Col("start_station_id", "fk", "start station", ref="stations", zipf=1.0, index=True),
        Col("end_station_id", "fk", "end station", ref="stations", zipf=1.0),
        Col("start_date", "date", "start date", lo=2022, hi=2024),
        Col("duration_min", "int", "duration in minutes", lo=14, hi=0.7, dist="lognormal"),
        Col("rider", "code", "rider type", values=("M", "C"), labels=("member", "casual"),
            phrase="trips by {label} riders", zipf=1.2),
        Col("distance_km", "float", "distance in km", lo=2.5, hi=0.6, dist="lognormal", decimals=2, nulls=0.1))),
))

INSPECTIONS = Domain("food_inspections", "restaurant health inspections", (
    Table("restaurants", "restaurant", "restaurants", 500, 12_000, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", index=True, words=(
            tuple("Golden Silver Red Blue Green Happy Lucky Little Royal Old New Corner Village Urban Rustic Sunny "
                  "Spicy Sweet Hungry Crispy Smoky Salty Copper Jade Lotus Olive Saffron Basil Ginger Maple".split()),
            tuple("Dragon Garden Spoon Fork Table Kitchen Oven Pot Bowl Leaf Lantern Harbor Barrel Anchor Pepper "
                  "Lemon Tiger Panda Goat Rooster Fox Bear Owl Whale Mango Fig Plum Radish Tomato Noodle".split()),
            ("Cafe", "Grill", "Kitchen", "Bistro", "Diner", "House", "Bar", "Eatery", "Tavern", "Canteen"))),
        Col("cuisine", "cat", "cuisine", values=("american", "chinese", "italian", "mexican", "japanese", "indian",
                                                 "thai", "french", "korean", "greek", "vietnamese", "turkish"),
            zipf=1.1, dirty=0.1),
        Col("borough", "cat", "borough", values=("Central", "North", "South", "East", "West"), zipf=0.6),
        Col("grade", "cat", "grade", values=("A", "B", "C"), zipf=1.8, na=0.12))),
    Table("inspections", "inspection", "inspections", 2_000, 60_000, (
        Col("id", "pk", "id"), Col("restaurant_id", "fk", "restaurant", ref="restaurants", zipf=0.5, index=True),
        Col("inspection_date", "date", "inspection date", lo=2018, hi=2024),
        Col("score", "int", "score", lo=0, hi=60),
        Col("result", "cat", "result", values=("pass", "conditional pass", "fail", "closed"), zipf=1.7))),
    Table("violations", "violation", "violations", 4_000, 120_000, (
        Col("id", "pk", "id"), Col("inspection_id", "fk", "inspection", ref="inspections", zipf=0.3, index=True),
        Col("category", "cat", "category", values=("temperature control", "pest control", "handwashing", "storage",
                                                   "labeling", "cleanliness", "equipment", "training"), zipf=1.0),
        Col("severity", "code", "severity", values=("N", "C"), labels=("non-critical", "critical"),
            phrase="{label} violations", zipf=1.0),
        Col("fine", "float", "fine", lo=80.0, hi=0.8, dist="lognormal", decimals=2, nulls=0.3))),
))

HR = Domain("hr_payroll", "a company's staff and payroll", (
    Table("departments", "department", "departments", 12, 20, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(("Finance", "Legal", "Marketing", "Sales", "Research",
                                                         "Logistics", "Support", "Engineering", "Design",
                                                         "Operations"), ("East", "West"))),
        Col("budget", "float", "budget in thousands", lo=800, hi=0.8, dist="lognormal", decimals=1))),
    Table("employees", "employee", "employees", 1_000, 20_000, (
        Col("id", "pk", "id"), _person(index=True),
        Col("department_id", "fk", "department", ref="departments", zipf=0.9, index=True),
        Col("title", "cat", "job title", values=("analyst", "engineer", "manager", "associate", "director",
                                                 "specialist", "coordinator", "intern"), zipf=1.0, dirty=0.06),
        Col("hire_date", "date", "hire date", lo=2005, hi=2024),
        Col("contract", "code", "contract type", values=("F", "P", "T"), labels=("full-time", "part-time",
                                                                                 "temporary"),
            phrase="{label} employees", zipf=1.4),
        Col("salary", "float", "annual salary", lo=62_000, hi=0.35, dist="lognormal", decimals=0, nulls=0.02))),
    Table("payroll", "payroll entry", "payroll entries", 6_000, 240_000, (
        Col("id", "pk", "id"), Col("employee_id", "fk", "employee", ref="employees", zipf=0.2, index=True),
        Col("pay_date", "date", "pay date", lo=2023, hi=2024),
        Col("gross", "float", "gross pay", lo=4_800, hi=0.35, dist="lognormal", decimals=2),
        Col("overtime_hours", "float", "overtime hours", lo=4.0, hi=0.8, dist="lognormal", decimals=1,
            nulls=0.4))),
))

HOTELS = Domain("hotel_bookings", "a hotel chain's bookings", (
    Table("hotels", "hotel", "hotels", 40, 300, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(TOWNS, ("Inn", "Lodge", "Suites", "Resort", "Hotel"))),
        Col("city", "cat", "city", values=CITY_VALUES, zipf=0.9, dirty=0.07),
        Col("stars", "int", "star rating", lo=1, hi=5))),
    Table("guests", "guest", "guests", 1_200, 30_000, (
        Col("id", "pk", "id"), _person(index=True),
        Col("country", "cat", "country", values=("USA", "UK", "Germany", "France", "Japan", "Brazil", "India",
                                                 "Canada", "Spain", "Italy"), zipf=1.0),
        Col("loyalty", "code", "loyalty level", values=("N", "S", "G"), labels=("no", "silver", "gold"),
            phrase="guests with {label} loyalty status", zipf=1.3))),
    Table("bookings", "booking", "bookings", 9_000, 200_000, (
        Col("id", "pk", "id"), Col("hotel_id", "fk", "hotel", ref="hotels", zipf=0.9, index=True),
        Col("guest_id", "fk", "guest", ref="guests", zipf=0.5, index=True),
        Col("checkin_date", "date", "check-in date", lo=2021, hi=2024),
        Col("nights", "int", "number of nights", lo=2.2, hi=0.6, dist="lognormal"),
        Col("room", "code", "room type", values=("S", "D", "U"), labels=("single", "double", "suite"),
            phrase="{label} room bookings", zipf=1.1),
        Col("price", "float", "price per night", lo=120.0, hi=0.5, dist="lognormal", decimals=2, nulls=0.03),
        Col("status", "cat", "status", values=("completed", "cancelled", "no-show", "upcoming"), zipf=1.8))),
))

MUSIC = Domain("music_streams", "a music streaming service", (
    Table("artists", "artist", "artists", 200, 4_000, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(
            tuple("The Black White Neon Velvet Silent Electric Wild Golden Crimson Lunar Solar Midnight Paper Glass "
                  "Iron Crystal Hollow Broken Northern".split()),
            tuple("Wolves Echoes Rivers Tigers Lights Shadows Horses Dreams Ravens Stones Waves Hearts Kings Ghosts "
                  "Pilots Sparrows Comets Lanterns Engines Foxes".split()), ("Band", "Collective", "Trio", "Project",
                                                                              "Club", "Society", "Orchestra",
                                                                              "Quartet", "Crew", "Union"))),
        Col("country", "cat", "country", values=("USA", "UK", "Sweden", "Korea", "Nigeria", "Brazil", "France",
                                                 "Australia"), zipf=1.1),
        Col("debut_year", "int", "debut year", lo=1965, hi=2023))),
    Table("tracks", "track", "tracks", 1_500, 60_000, (
        Col("id", "pk", "id"), Col("artist_id", "fk", "artist", ref="artists", zipf=0.9, index=True),
        Col("genre", "cat", "genre", values=("pop", "rock", "hip hop", "electronic", "jazz", "classical", "folk",
                                             "metal", "reggae", "soul"), zipf=1.0, dirty=0.08),
        Col("duration_s", "int", "duration in seconds", lo=215, hi=0.3, dist="lognormal"),
        Col("release_date", "date", "release date", lo=2000, hi=2024))),
    Table("listeners", "listener", "listeners", 800, 25_000, (
        Col("id", "pk", "id"), _person(),
        Col("plan", "code", "plan", values=("F", "P", "H"), labels=("free", "premium", "family"),
            phrase="listeners on the {label} plan", zipf=1.0),
        Col("age", "int", "age", lo=14, hi=75, nulls=0.1))),
    Table("plays", "play", "plays", 14_000, 300_000, (
        Col("id", "pk", "id"), Col("track_id", "fk", "track", ref="tracks", zipf=1.1, index=True),
        Col("listener_id", "fk", "listener", ref="listeners", zipf=0.6),
        Col("play_date", "date", "play date", lo=2023, hi=2024),
        Col("seconds_played", "int", "seconds played", lo=120, hi=0.8, dist="lognormal"),
        Col("device", "cat", "device", values=("mobile", "desktop", "speaker", "tv", "car"), zipf=1.4))),
))

SHIPPING = Domain("parcel_shipping", "a parcel delivery company", (
    Table("depots", "depot", "depots", 25, 120, (
        Col("id", "pk", "id"), Col("name", "name", "name", unique=True, words=(TOWNS, ("Depot", "Hub"))),
        Col("region", "cat", "region", values=("North", "South", "East", "West", "Central"), zipf=0.7),
        Col("capacity", "int", "daily capacity", lo=500, hi=20_000))),
    Table("couriers", "courier", "couriers", 300, 5_000, (
        Col("id", "pk", "id"), _person(index=True),
        Col("depot_id", "fk", "depot", ref="depots", zipf=0.8, index=True),
        Col("vehicle", "code", "vehicle", values=("V", "B", "C"), labels=("van", "bike", "car"),
            phrase="couriers driving a {label}", zipf=1.0),
        Col("hire_year", "int", "hire year", lo=2010, hi=2024))),
    Table("parcels", "parcel", "parcels", 12_000, 250_000, (
        Col("id", "pk", "id"), Col("courier_id", "fk", "courier", ref="couriers", zipf=0.5, index=True),
        Col("sent_date", "date", "sent date", lo=2022, hi=2024, index=True),
        Col("weight_kg", "float", "weight in kg", lo=1.5, hi=0.9, dist="lognormal", decimals=2, nulls=0.02),
        Col("service", "code", "service level", values=("S", "E", "N"), labels=("standard", "express",
                                                                               "next-day"),
            phrase="{label} parcels", zipf=1.2),
        Col("status", "cat", "status", values=("delivered", "in transit", "returned", "lost"), zipf=2.2,
            dirty=0.05),
        Col("postage", "float", "postage", lo=6.5, hi=0.5, dist="lognormal", decimals=2))),
))

MUSEUMS = Domain("museum_visits", "a group of museums", (
    Table("museums", "museum", "museums", 15, 40, (
        Col("id", "pk", "id"),
        Col("name", "name", "name", unique=True, words=(("City", "National", "Modern", "Maritime", "Science",
                                                         "Natural History", "Folk", "Railway"),
                                                        ("Museum", "Gallery", "Collection", "Hall", "Centre"))),
        Col("city", "cat", "city", values=CITY_VALUES, zipf=0.6),
        Col("founded", "int", "founding year", lo=1850, hi=2015))),
    Table("exhibitions", "exhibition", "exhibitions", 200, 3_000, (
        Col("id", "pk", "id"), Col("museum_id", "fk", "museum", ref="museums", zipf=0.7, index=True),
        Col("theme", "cat", "theme", values=("art", "history", "science", "nature", "design", "photography",
                                             "technology"), zipf=0.9, dirty=0.08),
        Col("start_date", "date", "start date", lo=2015, hi=2024),
        Col("cost", "float", "cost in thousands", lo=90.0, hi=0.7, dist="lognormal", decimals=1, nulls=0.05))),
    Table("tickets", "ticket", "tickets", 13_000, 250_000, (
        Col("id", "pk", "id"), Col("exhibition_id", "fk", "exhibition", ref="exhibitions", zipf=0.8, index=True),
        Col("visit_date", "date", "visit date", lo=2021, hi=2024),
        Col("kind", "code", "ticket kind", values=("A", "C", "S", "M"), labels=("adult", "child", "senior",
                                                                              "member"),
            phrase="{label} tickets", zipf=0.9),
        Col("price", "float", "price", lo=18.0, hi=0.3, dist="lognormal", decimals=2),
        Col("channel", "cat", "sales channel", values=("online", "desk", "kiosk", "partner"), zipf=1.3))),
))

DOMAINS: tuple[Domain, ...] = (RETAIL, FLIGHTS, SCHOOLS, CLINICS, FOOTBALL, LIBRARY, ENERGY, BIKES, INSPECTIONS, HR,
                               HOTELS, MUSIC, SHIPPING, MUSEUMS)
